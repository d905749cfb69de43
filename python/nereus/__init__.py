"""Nereus embedded in a Python RLHF framework (docs/embedding.md).

Everything is the C++ extension `_nereus`; this file only adds the two conversions that
need Python objects: a shard's or a workspace's memory as a torch tensor, and awaiting a transition under
asyncio.
"""
import asyncio as _asyncio

from . import _nereus
from ._nereus import Error, Job, Shard, Stage, Transition, Unit, Workspace, set_log_level

__all__ = ["Error", "Job", "Shard", "Stage", "Transition", "Unit", "Workspace", "set_log_level"]

if hasattr(_nereus, "Member"):  # built with the daemons' layer (docs/cluster.md)
    from ._nereus import Member, NodeUnit, Step

    __all__ += ["Member", "NodeUnit", "Step"]

    def _member_steps(self, timeout=None):
        """The steps the coordinator asks this node to run, until the job on this node
        ends; report() each before the next."""
        while (step := self.next_step(timeout)) is not None:
            yield step

    Member.steps = _member_steps


def _shard_data(self):
    """A torch tensor sharing the shard's memory (DLPack, zero-copy): writing it changes
    what Nereus moves. Valid until a transition destroys the unit."""
    import torch.utils.dlpack

    return torch.utils.dlpack.from_dlpack(self)


Shard.data = property(_shard_data)


def _workspace_data(self):
    """The workspace as a torch uint8 tensor (zero-copy); view it as what you need
    (`.view(torch.bfloat16)`). Valid only inside the stage's block."""
    import torch.utils.dlpack

    return torch.utils.dlpack.from_dlpack(self)


Workspace.data = property(_workspace_data)


def _transition_await(self):
    # wait() releases the GIL; run it on the loop's default executor.
    return _asyncio.get_running_loop().run_in_executor(None, self.wait).__await__()


Transition.__await__ = _transition_await
