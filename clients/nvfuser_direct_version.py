"""``nvfuser_direct.nvfuser_direct_version`` under fusecut: the same Version as
``fusecut.nvfuser_version`` (nvFuser's two frontends each have the module)."""

from fusecut.nvfuser_version import Version, version

__all__ = ["Version", "version"]
