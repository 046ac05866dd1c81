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
    // A section with nothing to show is hidden whole: its title, table and the note of
    // rows not listed, which would otherwise read as the previous section's.
    var total = 0;
    document.querySelectorAll('section.rows').forEach(function (section) {
      section.hidden = section.querySelector('tr[data-changed]:not([hidden])') === null;
      total += Number(section.getAttribute('data-total')) || 0;
    });
    // Of every row compared, not only of those the page lists.
    if (shown) { shown.textContent = count + ' of ' + total + ' rows shown'; }
    if (nothing) { nothing.hidden = count > 0 || !only; }
  }
  if (box) { box.addEventListener('change', apply); }
  apply();
  document.documentElement.setAttribute('data-ready', 'yes');
})();
