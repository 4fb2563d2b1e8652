"""netgain: is moving a model's inference from CPU to GPU a net gain? Measured end to end.

The code lives in the design card's top-level folders, linked in here so that one import
namespace holds them: ``netgain.server``, ``netgain.loadgen``, ``netgain.protos``.
"""

__version__ = "0.1.0"
