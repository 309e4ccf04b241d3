"""The HTTP/1.x wire, used alike by the fronts, the providers and the simulator.

- ``request.py`` and ``response.py``: bytes to requests and responses, on llhttp (httptools) in
  its strict mode; pure, bounded, no I/O. ``chunks.py`` is the one hand-written piece: where a
  chunked request body ends, so that no byte past it reaches the parser.
- ``heads.py``: the response heads the server writes.
- ``server.py`` (with ``hang_ups.py``): the server, one task per connection.
- ``client.py`` and ``dial.py``: the streaming requests' client and its TCP dialling.
"""
