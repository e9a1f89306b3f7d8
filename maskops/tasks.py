"""Every task, declared once: its ``maskops`` subcommand and job action name, its options
(a dataclass whose fields are :func:`maskops.options_schema.option`) and its entry function.

The command line builds each subcommand's option flags from here
(:mod:`maskops.cli.options`), the control plane builds each job action's REST options model
(``maskops_core.options``) and the worker reads a job's options back into the same
dataclass. Standard library only: the control-plane core imports it without the engine's
libraries (the entry functions are named, not imported).
"""

from __future__ import annotations

from maskops.export.options import ExportOptions
from maskops.options_schema import TaskDeclaration

EXPORT = TaskDeclaration(
    name="export",
    options=ExportOptions,
    entry="maskops.export.export_onnx",
    summary="export a model to ONNX (fp32, fp16, int8 QDQ), validated against PyTorch",
    takes_model=True,
)

TASKS: dict[str, TaskDeclaration] = {task.name: task for task in (EXPORT,)}
"""Every declared task by name."""
