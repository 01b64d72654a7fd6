__version__ = "2.11.0+cu130"
