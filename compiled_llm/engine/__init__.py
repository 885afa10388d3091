"""The engine core loop (schedule -> launch -> collect) and input processing (tokenize,
validate, fan out n > 1)."""
