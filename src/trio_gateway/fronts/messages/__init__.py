"""Anthropic's Messages API: the routes (``route``), the request reader (``request``) and its
Anthropic-only fields (``extras``), and the events and errors in Anthropic's shape
(``events``)."""
