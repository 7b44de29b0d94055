"""What a GGUF model is made of: shard sets (strict open and tolerant scan), block layout, set ids."""
