"""Providers: one pure dialect per vendor behind one I/O shell (``upstream.py``).

A new vendor is one subpackage with its dialect (``dialect.py`` says what a dialect provides) and
one line in ``registry.py``.
"""
