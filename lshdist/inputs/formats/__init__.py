"""One module per family of input formats; `lshdist.inputs.registry` names and dispatches them."""
