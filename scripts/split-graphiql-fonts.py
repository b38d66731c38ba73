#!/usr/bin/env python3
"""Moves the fonts GraphiQL's CSS carries inline (34 faces as base64 data
URLs, 360 KB of the file) into files of their own beside it, so that a
browser fetches only the faces the page uses (those of the fonts, styles and
unicode ranges it draws: two or three). Run once on the vendored
`graphiql.min.css` (web/vendor/graphiql/README.md says from where); it
rewrites the CSS in place and writes `fonts/`. Running it again on the
split CSS changes nothing.
"""
import base64
import pathlib
import re
import sys

here = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "web/vendor/graphiql")
css_path = here / "graphiql.min.css"
css = css_path.read_text()
fonts = here / "fonts"
fonts.mkdir(exist_ok=True)

face = re.compile(r"@font-face\s*\{.*?\}", re.S)
data = re.compile(r"url\(data:font/(woff2?);base64,([A-Za-z0-9+/=\s]+)\)")
seen = {}


def split(match):
    block = match.group(0)
    family = re.search(r"font-family:\s*([^;]+);", block).group(1).strip().strip("'\"")
    style = re.search(r"font-style:\s*([^;]+);", block).group(1).strip()
    weight = re.search(r"font-weight:\s*([^;]+);", block).group(1).strip()

    def to_file(found):
        kind, encoded = found.group(1), re.sub(r"\s", "", found.group(2))
        stem = f"{family.lower().replace(' ', '-')}-{style}-{weight}"
        n = seen.setdefault(stem, 0)
        seen[stem] = n + 1
        name = f"{stem}-{n}.{kind}"
        (fonts / name).write_bytes(base64.b64decode(encoded))
        return f"url(fonts/{name})"

    return data.sub(to_file, block)


split_css = face.sub(split, css)
css_path.write_text(split_css)
print(f"{len(css)} -> {len(split_css)} bytes; {sum(seen.values())} fonts in {fonts}")
