"""The reference copies of the shape files (docs/shape.md): what every component carries."""
