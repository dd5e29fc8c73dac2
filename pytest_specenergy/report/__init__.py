"""Renderings of measured pairs: the terminal table and the JSON document."""
