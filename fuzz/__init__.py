"""Coverage-guided fuzzing of AgentCall's parsers (atheris); see fuzz/README.md."""
