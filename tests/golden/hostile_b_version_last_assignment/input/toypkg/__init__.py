__version__ = "1.0.0"
__version__ = "2.5.0"
