"""The public contract of rlwatch: wire formats and the data every other package shares.

Events (``contract.events``), alerts (``contract.alert``), control commands
(``contract.commands``), connection settings (``contract.settings``), the metric-name maps of
the frameworks (``contract.presets``) and the YAML reader that reports line numbers
(``contract.yaml_lines``). This package is the bottom layer: it imports nothing of the project.
"""
