"""Checking models: inspect (what a file holds), verify (prove a composite), llama_check (the real loader)."""
