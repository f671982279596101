"""The training run's orchestration (orchestration layer): the run as named stages (``run.TrainingRun``), what it
checks before anything starts (``cluster``, ``driver``), the coordinator that admits prompt groups, the publisher
and metrics sink, validation, and the step log. It wires ``deployments`` to ``trainers``; entry points in ``apps``
call it."""
