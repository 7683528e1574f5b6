"""Request preparation: messages and their image parts, the chat template, prompts (and their
images), request options, client fields, logit bias and resolved generation values. Uses
`decoding` and `images`."""
