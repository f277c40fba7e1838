"""The two ways an emulation stops: the kernel did something wrong, or the emulator met IR it does not know."""


class EmulationError(RuntimeError):
    """The kernel did something the device would not do right (race, divergent barrier, out of bounds, a wait)."""


class Unsupported(NotImplementedError):
    """An IR node the emulator does not know: refused rather than guessed."""
