"""Rumba prototype plugin for rinad, the userspace RINA stack in Rust.

A Rumba experiment written for IRATI or rlite runs on rinad by changing its
prototype import::

    # from rumba.prototypes.rlite import Experiment
    from rumba_rina import Experiment

The plugin writes one rinad configuration per node from Rumba's model
(shim-udp, shim-eth and normal DIFs, QoS cubes, registrations,
enrollments), starts rinad on every node, waits until every normal DIF has
assembled itself, and translates the storyboard's `rinaperf` and
`rina-echo-async` command lines into rina-perf and rina-echo.
"""

from rumba_rina.config import ConfigError, node_configs
from rumba_rina.prototype import Experiment
from rumba_rina.tools import translate_command

__all__ = ["Experiment", "ConfigError", "node_configs", "translate_command"]
