"""Reports: terminal tables, markdown, self-contained HTML with plots, and exports to other tools' formats."""
