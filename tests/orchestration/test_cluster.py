"""Multi-node checks before a run starts (orchestration/cluster.py): placement decides which nodes a role can use;
a node-local checkpoint folder, a trace store on the driver's disk and a missing file fail with the key, node and
path. The node lists are hand-written (what ``ray.nodes()`` reports for a head and a worker pod)."""

from __future__ import annotations

import pytest
import ray

from agents.data import arithmetic
from agents.data.rows import validate_row
from agents.tools.registry import load_tools
from orchestration import cluster
from orchestration.cluster import ClusterError, Node
from configs import load_config
from tests.deployments.conftest import ray_cluster  # noqa: F401  (the session cluster fixture)

HEAD = Node("a" * 56, "10.0.0.1", {"CPU": 4.0}, {"ray.io/node-group": "headgroup"})
ROLLOUT = Node("b" * 56, "10.0.0.2", {"CPU": 8.0, "GPU": 1.0, "rollout_node": 1.0},
               {"ray.io/node-group": "rollout", "ray.io/accelerator-type": "H100"})


def _cfg(*overrides: str):
    return load_config("configs/demo_cpu.yaml", ["trainer.device=cpu", *overrides])


def _sql_rows(db: str):
    row = arithmetic.make_rows(1, seed=0, split="train")[0]
    row["extra_info"]["tools_kwargs"] = {"execute_sql": {"create_kwargs": {"db_path": db}}}
    return [validate_row(row, "row 0")]


@pytest.mark.unit
def test_placement_keys_choose_the_nodes_a_role_can_use():
    cfg = _cfg("serve.placement.resources={rollout_node: 1}",
               "trainer.placement.label_selector={ray.io/node-group: headgroup}",
               "actor_rollout_ref.rollout.agent.placement.label_selector={ray.io/accelerator-type: H100}")
    roles = {r.key: [n.address for n in r.nodes]
             for r in cluster.roles(cfg, [HEAD, ROLLOUT], [], {}, deploy_rollout=True, learner=True)}
    assert roles == {"rollout": ["10.0.0.2"], "trainer": ["10.0.0.1"], "agents": ["10.0.0.2"]}
    anywhere = cluster.roles(_cfg(), [HEAD, ROLLOUT], [], {}, deploy_rollout=True, learner=True)
    assert all(len(r.nodes) == 2 for r in anywhere)
    assert not ROLLOUT.fits(cfg.serve.placement, cpus=9.0)  # CPUs count too, and GPUs
    on_gpus = cluster.roles(_cfg("serve.num_gpus_per_replica=1", "trainer.device=cuda"), [HEAD, ROLLOUT], [], {},
                            deploy_rollout=True, learner=True)
    assert {r.key: [n.address for n in r.nodes] for r in on_gpus if r.key != "agents"} == {
        "rollout": ["10.0.0.2"], "trainer": ["10.0.0.2"]}


@pytest.mark.unit
def test_label_selectors_follow_rays_operators():
    from configs.sections import Placement

    def where(selector: dict[str, str]) -> list[str]:
        return [n.address for n in (HEAD, ROLLOUT) if n.fits(Placement(label_selector=selector))]

    assert where({"ray.io/node-group": "rollout"}) == ["10.0.0.2"]
    assert where({"ray.io/node-group": "!rollout"}) == ["10.0.0.1"]
    assert where({"ray.io/accelerator-type": "in(A100, H100)"}) == ["10.0.0.2"]
    assert where({"ray.io/accelerator-type": "!in(H100)"}) == ["10.0.0.1"]  # no label is not H100


@pytest.mark.unit
def test_a_path_two_keys_name_keeps_both_names():
    assert cluster.named(("/m", "actor_rollout_ref.model.path"), ("/m", "actor_rollout_ref.model.path"),
                         (None, "unset"), ("/m", "tokenizer")) == {"/m": "actor_rollout_ref.model.path and tokenizer"}


@pytest.mark.unit
def test_a_node_local_checkpoint_folder_is_refused_when_train_workers_can_run_elsewhere(tmp_path):
    cfg = _cfg(f"trainer.default_local_dir={tmp_path / 'run'}")
    with pytest.raises(ClusterError) as error:
        cluster._check_storage(cfg, HEAD.node_id, [HEAD, ROLLOUT])
    text = str(error.value)
    assert f"checkpoints would go to {tmp_path / 'run' / 'ray_train'}" in text
    assert "10.0.0.2" in text and "trainer.storage_path" in text and "s3://" in text
    cluster._check_storage(cfg, HEAD.node_id, [HEAD])  # the learner pinned to the driver's node: fine
    for uri in ("s3://bucket/runs", "gs://bucket/runs", f"file://{tmp_path}/nfs"):
        cluster._check_storage(_cfg(f"trainer.storage_path={uri}"), HEAD.node_id, [HEAD, ROLLOUT])


@pytest.mark.unit
def test_a_trace_store_on_the_drivers_disk_is_refused_when_agent_workers_can_run_elsewhere():
    with pytest.raises(ClusterError, match=r"tracking.mlflow_tracking_uri=sqlite:///mlruns.db is a store only the "
                       r"driver's node reaches.*10\.0\.0\.2.*http://<host>:5000.*trace.backend=none"):
        cluster._check_tracking(_cfg(), HEAD.node_id, [HEAD, ROLLOUT])
    with pytest.raises(ClusterError, match="loopback"):  # a server on the driver's loopback is as unreachable
        cluster._check_tracking(_cfg("tracking.mlflow_tracking_uri=http://127.0.0.1:5000"), HEAD.node_id,
                                [HEAD, ROLLOUT])
    cluster._check_tracking(_cfg(), HEAD.node_id, [HEAD])
    cluster._check_tracking(_cfg("tracking.mlflow_tracking_uri=http://mlflow:5000"), HEAD.node_id, [HEAD, ROLLOUT])
    cluster._check_tracking(_cfg("actor_rollout_ref.rollout.trace.backend=none"), HEAD.node_id, [HEAD, ROLLOUT])


@pytest.mark.unit
def test_tool_assets_come_from_rows_and_tool_configs(tmp_path):
    tools = load_tools("agents/tools/configs/sql_tools.yaml")
    assets = cluster.tool_assets(tools, _sql_rows("chinook.sqlite"))
    assert assets == {"data/sql/chinook.sqlite": "row 0 (tandem/arithmetic/easy) tools_kwargs.execute_sql"}
    shared = load_tools({"tools": [{"class_name": "execute_sql", "config": {"db_path": str(tmp_path / "x.db")}}]})
    assert cluster.tool_assets(shared, []) == {str(tmp_path / "x.db"): "tool execute_sql's config"}


@pytest.mark.integration
def test_a_missing_asset_names_the_node_and_the_path(ray_cluster, tiny_model_dir, tmp_path):
    """A real task on the node checks the files: the model exists, the row's database does not."""
    cfg = _cfg(f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.default_local_dir={tmp_path / 'run'}")
    tools = load_tools("agents/tools/configs/sql_tools.yaml")
    missing = str(tmp_path / "nowhere" / "chinook.sqlite")
    with pytest.raises(ClusterError) as error:
        cluster.check_cluster(cfg, _sql_rows(missing), tools, deploy_rollout=True, learner=True)
    text = str(error.value)
    node = ray.get_runtime_context().get_node_id()
    assert f"({node[:12]}): {missing} is missing (row 0 (tandem/arithmetic/easy) tools_kwargs.execute_sql, for the agent " \
           "workers" in text, text
    assert str(tiny_model_dir) not in text
    nodes = cluster.check_cluster(cfg, [], tools, deploy_rollout=True, learner=True)  # no rows, nothing missing
    assert [n.node_id for n in nodes] == [node]
    # relative paths resolve where the task runs (the node's working directory), and the error says where
    with pytest.raises(ClusterError, match=r"data/sql/nowhere.sqlite \(there: /.*/data/sql/nowhere.sqlite\) is missing"):
        cluster.check_cluster(cfg, _sql_rows("nowhere.sqlite"), tools, deploy_rollout=True, learner=True)
    # file:// checkpoint storage: every train worker's node must see a marker the driver writes there
    shared = _cfg(f"actor_rollout_ref.model.path={tiny_model_dir}", f"trainer.storage_path=file://{tmp_path}/nfs")
    cluster.check_cluster(shared, [], tools, deploy_rollout=True, learner=True)
    assert list((tmp_path / "nfs").iterdir()) == []  # the marker was removed


@pytest.mark.integration
def test_the_driver_keeps_a_copy_of_adapters_written_on_another_node(ray_cluster, tmp_path):
    """A learner on another node wrote ``adapters/v2`` on its own disk: the publisher writes the object-store copy
    to the same path on the driver's node, replacing what an earlier run left there."""
    from dataclasses import replace

    from agents.records import AdapterRef
    from trainers.publisher import shareable

    written = tmp_path / "learner" / "v2"
    written.mkdir(parents=True)
    (written / "adapter_config.json").write_text("{}")
    (written / "adapter_model.safetensors").write_bytes(b"\x00" * 1000)
    ref = shareable(AdapterRef(2, str(written)))
    cluster.keep_copy(ref)  # written on this node: nothing to do
    assert sorted(p.name for p in written.parent.iterdir()) == ["v2"]
    copy = tmp_path / "driver" / "adapters" / "v2"
    copy.mkdir(parents=True)
    (copy / "stale_from_an_earlier_run.safetensors").write_bytes(b"old")
    cluster.keep_copy(replace(ref, path=str(copy), node_id="f" * 56))
    assert sorted(p.name for p in copy.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert (copy / "adapter_model.safetensors").read_bytes() == b"\x00" * 1000
    assert sorted(p.name for p in copy.parent.iterdir()) == ["v2"]  # no partial or old folder left
