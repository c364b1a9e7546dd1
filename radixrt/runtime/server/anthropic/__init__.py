"""anthropic"""
