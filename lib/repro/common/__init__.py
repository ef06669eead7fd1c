"""Code used by two or more papers; each module's docstring lists its users. A paper module never imports
another paper module: what two papers share moves here on its second use."""
