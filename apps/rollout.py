"""``serve deploy serve_config.yaml`` entry point (apps layer): the Serve config's ``import_path:
apps.rollout:build_app`` names this module. The app itself is built in ``deployments.rollout_app``."""

from deployments.rollout_app import RolloutAppArgs, build_app

__all__ = ["RolloutAppArgs", "build_app"]
