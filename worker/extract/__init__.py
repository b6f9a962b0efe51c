"""A job's declarative extraction: the ``extract`` section of its spec, run over a page.

extraction  compile_extraction (the section checked, SpecError at a field's path) and Extraction
spec        the section's shape: rules, fields, types, metadata and content, compiled once
fields      a field's strings by CSS (lexbor) or XPath (parsel), and its type applied
metadata    JSON-LD, OpenGraph and microdata from the page's tree
content     main content as markdown or text (trafilatura, the optional extra ``markdown``)
"""

from jetcrawl.worker.extract.extraction import HTML_TYPES, Extraction, compile_extraction

__all__ = ["HTML_TYPES", "Extraction", "compile_extraction"]
