"""The report: its page, sections, figures and browser rendering."""
