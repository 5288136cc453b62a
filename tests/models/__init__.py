"""Tests for models/: format, tokenizer, tiny model, policy I/O, generation engines."""
