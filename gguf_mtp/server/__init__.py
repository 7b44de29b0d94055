"""The user's own llama-server, driven and measured: ``gguf-mtp bench`` (:mod:`.bench`) with its pure rules
(:mod:`.bench_rules`) and plot (:mod:`.bench_plot`), llama-server's options read from its ``--help``
(:mod:`.options`) and its process, started and always stopped (:mod:`.process`)."""
