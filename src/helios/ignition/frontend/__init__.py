"""Prepare-time frontend analysis: what a checkpoint's chat template, tokenizer and configuration
declare about its prompts and outputs, turned into typed contract data.

Modules: `render` (the Hugging Face chat-template dialect in a jinja2 sandbox), `probes` (rendering
probe conversations and reading boundaries, reasoning and tool markup from them), `families` (the
declared families and their parser syntax), `sampling` (generation_config.json recommendations).
"""
