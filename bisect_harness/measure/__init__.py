"""Measuring a server: the streaming APIs, the benchmark client, request bodies, and the
metric sources read around each sample."""
