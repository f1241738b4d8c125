#!/bin/bash
# Bundles the page (esbuild) and lays out the assets Grafana's components load from
# window.__grafana_public_path__ (/public/): the icons of @grafana/ui and the Inter font.
set -e
cd "$(dirname "$0")"
mkdir -p dist/public/build/img dist/public/fonts/inter
npx esbuild src/main.jsx --bundle --minify --format=iife --jsx=automatic --loader:.js=jsx --loader:.ttf=file --loader:.woff=file --loader:.woff2=file --loader:.svg=file --loader:.png=file --loader:.gif=file \
  --define:process.env.NODE_ENV='"production"' --outfile=dist/bundle.js --log-level=warning
rm -rf dist/public/build/img/icons && cp -r node_modules/@grafana/ui/dist/public/img/icons dist/public/build/img/icons
cp node_modules/@fontsource/inter/files/inter-latin-400-normal.woff2 dist/public/fonts/inter/Inter-Regular.woff2
cp node_modules/@fontsource/inter/files/inter-latin-500-normal.woff2 dist/public/fonts/inter/Inter-Medium.woff2
cp node_modules/@fontsource/inter/files/inter-latin-400-italic.woff2 dist/public/fonts/inter/Inter-Italic.woff2
cp node_modules/@fontsource/inter/files/inter-latin-500-italic.woff2 dist/public/fonts/inter/Inter-MediumItalic.woff2
cat > dist/index.html <<'HTML'
<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kat-scheduler</title>
<script>window.__grafana_public_path__ = "/public/";</script>
<link rel="stylesheet" href="bundle.css">
<style>
body { margin: 0; }
@font-face { font-family: "Inter"; font-style: normal; font-weight: 400; src: url("/public/fonts/inter/Inter-Regular.woff2") format("woff2"); }
@font-face { font-family: "Inter"; font-style: normal; font-weight: 500; src: url("/public/fonts/inter/Inter-Medium.woff2") format("woff2"); }
</style><script src="data.js"></script></head>
<body class="theme-dark"><div id="root"></div><script src="bundle.js"></script></body></html>
HTML
