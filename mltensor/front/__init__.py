"""Front: the WebNN objects users touch. Validates every argument; records, never computes."""
