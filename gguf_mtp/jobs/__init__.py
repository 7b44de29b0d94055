"""The jobs: compose, extract, strip, graft and convert, each a pure planner plus a call of the one writer."""
