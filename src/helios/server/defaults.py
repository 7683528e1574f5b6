"""`helios serve`'s HTTP bounds and timeouts where its flags name none, in a module that imports
neither torch nor the HTTP stack: the command's parser and help read them before the serving stack
is imported, and the engine process is started before that import (`helios.cli.serve_cmd`).
"""

DEFAULT_MAX_BODY_NBYTES = 4 * 1024 * 1024  # a larger request body gets 413 (`body_guard`); with images see below
DEFAULT_BODY_TIMEOUT_S = 60.0  # from the end of a request's headers to the end of its body (`body_guard`)
DEFAULT_MAX_HEAD_NBYTES = 64 * 1024  # request line plus headers; larger gets 431 (`connection_limits`)
DEFAULT_HEAD_TIMEOUT_S = 30.0  # from a connection's accept to the end of its request's headers
DEFAULT_MAX_CONNECTIONS = 4096  # open connections at once; one more gets 503
DEFAULT_SEND_TIMEOUT_S = 60.0  # a response write's wait for a client that stopped reading (`responses`)
DRAIN_SECONDS = 5  # after a stop signal: how long open responses may run on (`serve`)
DEFAULT_MAX_IMAGES = 4  # images per request (`helios.frontend.images.decode.ImageLimits`)
DEFAULT_MAX_IMAGE_NBYTES = 2 * 1024 * 1024  # encoded bytes per image
IMAGE_PART_NBYTES = 256  # an image part's JSON around its data: URL's payload ({"type": "image_url", ...})


def image_body_nbytes(max_images: int, max_image_nbytes: int) -> int:
    """The body bytes `max_images` images of `max_image_nbytes` each take as base64 data: URLs
    (4 characters for every 3 bytes, and their parts' JSON)."""
    return max_images * (4 * -(-max_image_nbytes // 3) + IMAGE_PART_NBYTES)


def default_max_body_nbytes(max_images: int, max_image_nbytes: int) -> int:
    """The body limit of a server of a core file without ``--max-body-bytes``: the text default plus
    room for as many images as the image flags admit, so a request of ``--max-images`` images at
    ``--max-image-bytes`` is refused by neither (15,380,144 at the image defaults). The images count
    against a vision core's own bounds (`helios.frontend.images`); a text core refuses image parts."""
    return DEFAULT_MAX_BODY_NBYTES + image_body_nbytes(max_images, max_image_nbytes)
