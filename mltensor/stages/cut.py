"""What crosses a cut between two stages: Carried, a value the next stage reads. The importer's
side of a cut makes them (mltensor/onnx/resume.py); plan.py and loop.py bind them to a run's
tensors."""


class Carried:
    """A value crossing a cut: a tensor named `avail` in the run (a feed or an earlier stage's
    output), or a host array (`host`)."""

    __slots__ = ("avail", "data_type", "shape", "is_bool", "host")

    def __init__(self, avail=None, data_type=None, shape=(), is_bool=False, host=None):
        self.avail, self.data_type, self.shape = avail, data_type, tuple(shape)
        self.is_bool, self.host = is_bool, host

    def __repr__(self):
        if self.host is not None:
            return f"<host {self.host.dtype}{list(self.host.shape)}>"
        return f"<{self.avail} {'bool' if self.is_bool else self.data_type}{list(self.shape)}>"
