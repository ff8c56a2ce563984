"""Command-line tools (thin layers over the libraries): sample evaluation, and later checkpoint
converters, data preparation, model evaluation reports and run comparison."""
