"""Children and flows of the framework integration tests (Pydantic AI, OpenAI Agents SDK)."""
