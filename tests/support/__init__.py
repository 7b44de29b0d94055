"""The tests' support code: tiny checkpoint builders, gguf-py views for assertions, llama.cpp's converter as a
peer, the Hub stand-ins and loopback servers. Imported as ``support.<module>`` (pytest puts ``tests/`` on the
path); no test lives here."""
