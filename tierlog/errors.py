"""The product's errors: one base class for what tierlog's agent, archiver, jobs and command raise of their own.

The libraries keep theirs (rlmm.errors.RemoteStorageError and its subclasses, which rsm shares).
"""


class TierlogError(Exception):
    """A failure of tierlog's own tooling; the message names what is wrong and what to do."""
