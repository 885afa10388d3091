"""Executors: how the engine reaches its workers. One interface; the uniprocess executor runs
the one worker in the engine's process."""
