// The compare page's one control: show every row, or only those whose verdict is a change.
(function () {
  'use strict';
  var box = document.getElementById('only-changes');
  var rows = Array.prototype.slice.call(document.querySelectorAll('table.rows tr[data-changed]'));
  var shown = document.getElementById('shown');
  var nothing = document.getElementById('nothing-changed');
  function apply() {
    var only = box && box.checked;
    var count = 0;
    rows.forEach(function (tr) {
      var ok = !only || tr.getAttribute('data-changed') === 'yes';
      tr.hidden = !ok;
      if (ok) { count++; }
    });
    document.querySelectorAll('table.rows').forEach(function (table) {
      var any = table.querySelector('tr[data-changed]:not([hidden])') !== null;
      table.hidden = !any;
      var title = table.previousElementSibling;
      if (title && title.tagName === 'H2') { title.hidden = !any; }
    });
    if (shown) { shown.textContent = count + ' of ' + rows.length + ' rows shown'; }
    if (nothing) { nothing.hidden = count > 0 || !only; }
  }
  if (box) { box.addEventListener('change', apply); }
  apply();
  document.documentElement.setAttribute('data-ready', 'yes');
})();
