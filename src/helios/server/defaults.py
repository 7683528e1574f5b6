"""`helios serve`'s HTTP bounds and timeouts where its flags name none, in a module that imports
neither torch nor the HTTP stack: the command's parser and help read them before the serving stack
is imported, and the engine process is started before that import (`helios.cli.serve_cmd`).
"""

DEFAULT_MAX_BODY_NBYTES = 4 * 1024 * 1024  # a larger request body gets 413 (`body_guard`)
DEFAULT_BODY_TIMEOUT_S = 60.0  # from the end of a request's headers to the end of its body (`body_guard`)
DEFAULT_MAX_HEAD_NBYTES = 64 * 1024  # request line plus headers; larger gets 431 (`connection_limits`)
DEFAULT_HEAD_TIMEOUT_S = 30.0  # from a connection's accept to the end of its request's headers
DEFAULT_MAX_CONNECTIONS = 4096  # open connections at once; one more gets 503
DEFAULT_SEND_TIMEOUT_S = 60.0  # a response write's wait for a client that stopped reading (`responses`)
DRAIN_SECONDS = 5  # after a stop signal: how long open responses may run on (`serve`)
