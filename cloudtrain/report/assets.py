"""The page's inline CSS and JavaScript (one file, nothing fetched)."""

CSS = """
:root{color-scheme:light dark;--fg:#1b1f24;--bg:#fff;--muted:#57606a;--line:#d0d7de;--zebra:#f6f8fa;--accent:#0550ae;
--bad:#a40e26;--ok:#116329}
@media (prefers-color-scheme:dark){:root{--fg:#e6edf3;--bg:#0d1117;--muted:#9da7b3;--line:#30363d;--zebra:#161b22;
--accent:#79c0ff;--bad:#ff7b72;--ok:#56d364}}
*{box-sizing:border-box}
body{margin:0 auto;max-width:1100px;padding:1rem 1.25rem 3rem;font:15px/1.45 system-ui,-apple-system,"Segoe UI",
Roboto,sans-serif;color:var(--fg);background:var(--bg)}
h1{font-size:1.6rem;margin:.2rem 0}h2{font-size:1.25rem;margin:2rem 0 .5rem;border-bottom:1px solid var(--line)}
h3{font-size:1.05rem;margin:1.2rem 0 .4rem}
a{color:var(--accent)}a:focus,button:focus,input:focus{outline:2px solid var(--accent);outline-offset:2px}
.muted{color:var(--muted)}.bad{color:var(--bad)}.ok{color:var(--ok)}
nav a{margin-right:.9rem}
.cards{display:flex;flex-wrap:wrap;gap:.75rem;margin:1rem 0}
.card{border:1px solid var(--line);border-radius:8px;padding:.5rem .9rem;min-width:10rem}
.card b{display:block;font-size:1.35rem}
table{border-collapse:collapse;width:100%;margin:.4rem 0 1rem;font-variant-numeric:tabular-nums}
caption{text-align:left;color:var(--muted);padding:.2rem 0}
th,td{border-bottom:1px solid var(--line);padding:.25rem .5rem;text-align:left;vertical-align:top}
td.n,th.n{text-align:right}tbody tr:nth-child(even){background:var(--zebra)}
th button{all:unset;cursor:pointer;font-weight:600}th button::after{content:" \\2195";color:var(--muted)}
.scroll{overflow-x:auto}
svg.chart{width:100%;height:auto;max-width:720px;display:block;color:var(--fg)}
svg .grid{stroke:var(--line);stroke-width:1}svg .tick,svg .axis{fill:var(--muted);font-size:11px}
svg .axis{font-size:12px}svg .dot{fill:#0072B2;fill-opacity:.8}svg .dot.best{fill:#D55E00}
svg .line{fill:none;stroke:#0072B2;stroke-width:2}svg .budget{stroke:var(--bad);stroke-dasharray:6 4}
.filter{display:none;margin:.3rem 0;padding:.3rem .5rem;font:inherit;width:min(24rem,100%);color:var(--fg);
background:var(--bg);border:1px solid var(--line);border-radius:6px}
.js .filter{display:block}
.grid2{display:grid;grid-template-columns:repeat(auto-fit,minmax(460px,1fr));gap:.5rem}
td{white-space:nowrap}
@media print{nav,.filter{display:none!important}body{max-width:none;font-size:11px}
h2{break-after:avoid}table,svg{break-inside:avoid}a{color:inherit;text-decoration:none}
details>summary{display:none}}
"""

# Sorting (click a column header) and filtering (type in the box above a table); the tables are
# complete HTML without it. Numbers sort by their data-v (seconds, dollars) or their text.
JS = """
document.documentElement.classList.add('js');
window.addEventListener('beforeprint',function(){document.querySelectorAll('details').forEach(function(d){d.open=true;});});
function key(td){var v=td.getAttribute('data-v');if(v!==null)return parseFloat(v);
var t=td.textContent.replace(/[$,%x]/g,'');var f=parseFloat(t);return isNaN(f)||!/^-?[0-9.]/.test(t)?td.textContent:f;}
document.querySelectorAll('table.sortable').forEach(function(table){
table.querySelectorAll('thead th').forEach(function(th,col){
var b=document.createElement('button');b.textContent=th.textContent;th.textContent='';th.appendChild(b);
b.addEventListener('click',function(){var body=table.tBodies[0];var rows=Array.prototype.slice.call(body.rows);
var dir=th.getAttribute('aria-sort')==='ascending'?-1:1;
table.querySelectorAll('thead th').forEach(function(h){h.removeAttribute('aria-sort');});
th.setAttribute('aria-sort',dir===1?'ascending':'descending');
rows.sort(function(a,b){var x=key(a.cells[col]),y=key(b.cells[col]);
if(typeof x===typeof y)return (x<y?-1:x>y?1:0)*dir;return (typeof x==='number'?-1:1)*dir;});
var frag=document.createDocumentFragment();rows.forEach(function(r){frag.appendChild(r);});body.appendChild(frag);});});});
document.querySelectorAll('input.filter').forEach(function(input){
var table=document.getElementById(input.getAttribute('aria-controls'));
input.addEventListener('input',function(){var q=input.value.toLowerCase();
Array.prototype.forEach.call(table.tBodies[0].rows,function(r){
r.hidden=q!==''&&r.textContent.toLowerCase().indexOf(q)<0;});});});
"""
