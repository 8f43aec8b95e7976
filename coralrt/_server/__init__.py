"""The compile service: ``coralrt serve-compiler`` (docs/compile-service.md).

A machine with edgetpu_compiler (x86-64 Linux) compiles Edge TPU segments
for machines without it, a fleet of Raspberry Pis for instance, whose
``remote`` compiler (:mod:`coralrt._compile.remote`) posts them.
:mod:`coralrt._server.service` holds what is done with an upload (checks,
one compile per segment however many clients ask, the service's own compile
cache, limits); :mod:`coralrt._server.app` the HTTP side, on aiohttp, which
the optional extra ``coralrt[server]`` installs.  Importing this package
does not import aiohttp.
"""

__all__: list[str] = []
