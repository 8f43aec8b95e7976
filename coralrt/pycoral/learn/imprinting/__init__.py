"""pycoral.learn.imprinting on coralrt: weight imprinting (module ``engine``)."""
