"""Image inputs on the frontend: decoding, preparation (pixels to patches) and layouts (patches to
prompt positions and vision tensors), each selected by the contract's frontend selectors."""
