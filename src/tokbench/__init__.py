"""tokbench: did this LLM serving change help, at which concurrency, by how much, beyond noise, and why?"""

__version__ = "0.1.0"
