"""What runs a prepared model: the device contract, programs, the executor, the pipeline.

``device.py`` is the contract every Edge TPU device implements; ``program.py``
the one :class:`~coralrt._runtime.program.Program` protocol a session drives
(CPU programs, executor programs and pipelined programs implement it);
``executor.py`` turns a compiled model into steps and runs them;
``pipeline.py`` spreads the steps over several sticks, with the stages and
worker threads of ``stages.py``; ``replicate.py`` loads the whole program on
each of several sticks and runs each request on a free one; ``worker.py`` is
a session's request queue and worker threads (``submit``, run timeouts);
``closing.py`` the requests in progress that a session's ``close`` waits for;
``feeds.py`` orders a request's inputs and picks its outputs.  Nothing here knows
which device, compiler or CPU backend it is given.
"""
