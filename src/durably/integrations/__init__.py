"""Durable agents written with other frameworks: wrap the agent, don't rewrite it.

One module per framework, each built on durably's public workflow API (every
model request and every tool call is a step) and on the framework's own public
extension points:

- :mod:`durably.integrations.pydantic_ai`: ``DurableAgent(agent)`` for Pydantic AI.
- :mod:`durably.integrations.openai_agents`: ``DurableRunner`` for the OpenAI Agents SDK.

Neither is imported here, so ``import durably`` never needs either framework.
"""
