"""Click commands: thin layers that parse, call the core, and render through `output`."""
