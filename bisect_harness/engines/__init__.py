"""Engines as they are: presets, benchmark tools, released builds, checkouts and their
environments, the server's lifecycle, attaching to a running server, profilers."""
