// Filters and navigation for report.html. This script never builds markup from text: it
// shows, hides and opens elements the page already has, and writes numbers with textContent.
(function () {
  'use strict';
  var filter = { status: 'all', suite: '', agent: '', text: '' };
  var runs = Array.prototype.slice.call(document.querySelectorAll('details.run'));
  var sections = Array.prototype.slice.call(document.querySelectorAll('section.scenario'));
  var shown = document.getElementById('shown');
  var none = document.getElementById('none-shown');
  var suiteBox = document.getElementById('f-suite');
  var agentBox = document.getElementById('f-agent');
  var textBox = document.getElementById('f-text');
  var statusButtons = Array.prototype.slice.call(document.querySelectorAll('button[data-status]'));
  var lowered = new Map();

  function textOf(el) {
    var t = lowered.get(el);
    if (t === undefined) {
      t = el.textContent.toLowerCase();
      lowered.set(el, t);
    }
    return t;
  }

  function runMatches(el) {
    return (filter.status === 'all' || el.getAttribute('data-status') === filter.status) &&
      (filter.suite === '' || el.getAttribute('data-suite') === filter.suite) &&
      (filter.agent === '' || el.getAttribute('data-agent') === filter.agent) &&
      (filter.text === '' || textOf(el).indexOf(filter.text) >= 0);
  }

  function filtering() {
    return filter.status !== 'all' || filter.agent !== '' || filter.text !== '';
  }

  function apply() {
    var count = 0;
    runs.forEach(function (el) {
      var ok = runMatches(el);
      el.hidden = !ok;
      if (ok) { count++; }
    });
    var sectionsShown = 0;
    sections.forEach(function (sec) {
      var suiteOk = filter.suite === '' || sec.getAttribute('data-suite') === filter.suite;
      var textOk = filter.text !== '' && textOf(sec.querySelector('.sc-head')).indexOf(filter.text) >= 0;
      var anyRun = sec.querySelector('details.run:not([hidden])') !== null;
      sec.hidden = !suiteOk || (filtering() && !anyRun && !textOk);
      if (!sec.hidden) { sectionsShown++; }
    });
    // Of the trajectories listed: on a page that leaves some out, "of 500" is not the run's.
    if (shown) {
      var listed = shown.hasAttribute('data-listed') ? ' listed' : '';
      shown.textContent = count + ' of ' + runs.length + listed + ' shown';
    }
    // A run with no trajectory says so already; "nothing matches" is for a filter.
    if (none) { none.hidden = sectionsShown > 0 || sections.length === 0; }
  }

  statusButtons.forEach(function (b) {
    b.addEventListener('click', function () {
      filter.status = b.getAttribute('data-status');
      statusButtons.forEach(function (x) { x.classList.toggle('on', x === b); x.setAttribute('aria-pressed', String(x === b)); });
      apply();
    });
  });
  if (suiteBox) { suiteBox.addEventListener('change', function () { filter.suite = suiteBox.value; apply(); }); }
  if (agentBox) { agentBox.addEventListener('change', function () { filter.agent = agentBox.value; apply(); }); }
  if (textBox) {
    textBox.addEventListener('input', function () { filter.text = textBox.value.toLowerCase().trim(); apply(); });
  }

  function clearFilters() {
    filter = { status: 'all', suite: '', agent: '', text: '' };
    statusButtons.forEach(function (x) { var on = x.getAttribute('data-status') === 'all'; x.classList.toggle('on', on); x.setAttribute('aria-pressed', String(on)); });
    if (suiteBox) { suiteBox.value = ''; }
    if (agentBox) { agentBox.value = ''; }
    if (textBox) { textBox.value = ''; }
    apply();
  }

  // A node of a transcript, or the run itself when its transcript is not in the page
  // (skipped, or transcripts not available).
  function target(id) {
    if (!id) { return null; }
    return document.getElementById(id) || document.getElementById(id.replace(/-n[0-9]+$/, ''));
  }

  // Opens every <details> around the target (a run, or a node of its transcript) and
  // brings it into view; a target hidden by the filters clears them first.
  function reveal(id) {
    var el = target(id);
    if (!el) { return; }
    if (el.closest('[hidden]')) { clearFilters(); }
    for (var p = el; p; p = p.parentElement) {
      if (p.tagName === 'DETAILS') { p.open = true; }
    }
    el.scrollIntoView({ block: 'start' });
    el.classList.add('flash');
    setTimeout(function () { el.classList.remove('flash'); }, 1400);
  }

  document.addEventListener('click', function (e) {
    var a = e.target.closest ? e.target.closest('a[href^="#"]') : null;
    if (!a) { return; }
    var id = a.getAttribute('href').slice(1);
    if (!target(id)) { return; }
    e.preventDefault();
    history.replaceState(null, '', '#' + id);
    reveal(id);
  });
  window.addEventListener('hashchange', function () { reveal(decodeURIComponent(location.hash.slice(1))); });
  document.addEventListener('keydown', function (e) {
    if (e.key === '/' && textBox && document.activeElement !== textBox) {
      e.preventDefault();
      textBox.focus();
    }
  });

  apply();
  if (location.hash) { reveal(decodeURIComponent(location.hash.slice(1))); }
  document.documentElement.setAttribute('data-ready', 'yes');
})();
