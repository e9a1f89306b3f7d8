"""The control plane's ``maskops`` subcommands (``serve``, ``token``).

The engine's command line finds them through the ``maskops.commands`` entry points
(pyproject.toml), so it never imports the control plane: where only the engine is
installed, these commands are simply absent.
"""
