"""Gleaner served to other programs: the HTTP service and the MCP server.

Thin on purpose: every call goes through the public ``gleaner`` API, as any platform's
would, and this package adds no rule of its own (no store or harvest imports here).
"""
