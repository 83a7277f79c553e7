"""The ``moeslo`` command line: a leaf; each command parses, calls a package and prints (see ``cli.main``)."""
