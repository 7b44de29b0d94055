"""Releases: publish (with its model card), the whole pipeline (plan, state) and the demo, above the jobs."""
